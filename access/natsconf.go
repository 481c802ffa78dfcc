package access

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/jwt/v2"
)

// ServerConfig writes the users' permissions as a nats-server
// authorization block, for a NATS server or cluster the engine does not
// run (engine --nats-url). source names the auth file in a comment.
func ServerConfig(w io.Writer, l Layout, users []User, source string) error {
	fmt.Fprintf(w, "# toolbatch users of %s (prefix %s), for nats-server's configuration\nauthorization {\n  users = [\n", source, l.Names.Prefix)
	for _, u := range users {
		p, err := l.Permissions(u)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "    # %s (role %s)\n    { nkey: %q, permissions: {\n", u.Name, u.Role, u.NKey)
		fmt.Fprintf(w, "        publish: %s\n        subscribe: %s\n", confRule(p.Publish), confRule(p.Subscribe))
		if p.AllowResponses {
			fmt.Fprintln(w, "        allow_responses: true")
		}
		fmt.Fprintln(w, "    } }")
	}
	_, err := fmt.Fprintln(w, "  ]\n}")
	return err
}

// confRule is a rule in nats-server's configuration syntax.
func confRule(r Rule) string {
	var parts []string
	if len(r.Allow) > 0 {
		parts = append(parts, "allow: "+confList(r.Allow))
	}
	if len(r.Deny) > 0 {
		parts = append(parts, "deny: "+confList(r.Deny))
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

func confList(list []string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // ">" as it is
	_ = enc.Encode(list)
	return strings.TrimSpace(b.String())
}

// UserClaims are u's JWT user claims with permissions p, for a
// decentralized (operator) setup: sign them with the account's key.
func UserClaims(u User, p Permissions) *jwt.UserClaims {
	uc := jwt.NewUserClaims(u.NKey)
	uc.Name = u.Name
	uc.Pub.Allow.Add(p.Publish.Allow...)
	uc.Pub.Deny.Add(p.Publish.Deny...)
	uc.Sub.Allow.Add(p.Subscribe.Allow...)
	uc.Sub.Deny.Add(p.Subscribe.Deny...)
	if p.AllowResponses {
		uc.Resp = &jwt.ResponsePermission{MaxMsgs: 1}
	}
	return uc
}
