package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/toolbatch/toolbatch/access"
	"github.com/toolbatch/toolbatch/catalog"
	"github.com/toolbatch/toolbatch/internal/cli"
	"github.com/toolbatch/toolbatch/protocol"
)

const authUsage = `usage:
  toolbatch auth create --file AUTH --role ROLE --name NAME [scope] [--out CREDS] [--account-seed FILE]
      add a user to the auth file and write its credentials (mode 0600;
      default NAME.creds); with --account-seed, the credentials are a
      signed NATS user JWT for a decentralized (operator) setup
      scope: --pool P,... (worker)  --principal P (approver)
             --principal P,... (console: the people it serves)
             --tools T,... (brain, delegate)  --resume (client)
  toolbatch auth list --file AUTH
  toolbatch auth revoke --file AUTH --name NAME
      remove a user (send the engine SIGHUP: its connections are closed)
  toolbatch auth permissions --file AUTH [--catalog FILE] [--prefix P] [--format server|jwt] [--name NAME]
      print the users' permissions as a nats-server authorization block,
      or as JWT user claims, for a NATS cluster the engine does not run
  toolbatch auth keys [connection flags]
      print the engines' public signing keys as a keys file (to pin, and
      to give to replay audit --keys), from the keys bucket
  toolbatch auth revoke-key KEY [--after SEQ] [connection flags]
      revoke an engine's signing key after an events-stream sequence
      (default: its last one now): what the key signed after it fails
      verification, and an engine holding it commits nothing more
      (admin role)

roles: engine, worker, client, approver, gate, brain, delegate, auditor, admin
`

// cmdAuth runs toolbatch auth SUBCOMMAND.
func cmdAuth(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return usageErrorf("auth: want create, list, revoke, permissions, keys or revoke-key (toolbatch auth -h)")
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "keys":
		return cmdKeys(rest, stdout)
	case "revoke-key":
		return cmdRevokeKey(rest, stdout)
	}
	fs := flag.NewFlagSet("auth "+sub, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	file := fs.String("file", "", "auth file (engine --auth)")
	var u access.User
	var pools, tools, out, accountSeed, catalogPath, prefix, format string
	switch sub {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, authUsage)
		return nil
	case "create":
		fs.StringVar((*string)(&u.Role), "role", "", "role")
		fs.StringVar(&u.Name, "name", "", "user name (a worker's --id)")
		fs.StringVar(&pools, "pool", "", "worker: pools, comma-separated")
		fs.StringVar(&u.Principal, "principal", "", "approver: the principal it answers as; console: the principals it serves, comma-separated")
		fs.StringVar(&tools, "tools", "", "brain, delegate: tools, comma-separated (default all)")
		fs.BoolVar(&u.Resume, "resume", false, "client: may publish unattributed resumes")
		fs.StringVar(&out, "out", "", "credentials file (default NAME.creds)")
		fs.StringVar(&accountSeed, "account-seed", "", "account nkey seed: write a signed user JWT")
		fs.StringVar(&catalogPath, "catalog", "", "with --account-seed: the engine's catalog (a worker's consumers)")
		fs.StringVar(&prefix, "prefix", protocol.DefaultPrefix, "with --account-seed: subject prefix")
	case "list":
	case "revoke":
		fs.StringVar(&u.Name, "name", "", "user to remove")
	case "permissions":
		fs.StringVar(&catalogPath, "catalog", "", "the engine's catalog: its sandbox tools by pool (workers' consumers)")
		fs.StringVar(&prefix, "prefix", protocol.DefaultPrefix, "subject prefix")
		fs.StringVar(&format, "format", "server", "server or jwt")
		fs.StringVar(&u.Name, "name", "", "one user only")
	default:
		return usageErrorf("auth: unknown subcommand %q (want create, list, revoke, permissions, keys or revoke-key)", sub)
	}
	if done, err := cli.Parse(fs, rest, io.Discard); done {
		if err == nil {
			fmt.Fprint(stdout, authUsage)
			return nil
		}
		return usageErrorf("auth %s: %v", sub, err)
	}
	if *file == "" {
		return usageErrorf("auth %s: --file AUTH is required", sub)
	}
	switch sub {
	case "create":
		u.Pools, u.Tools = splitList(pools), splitList(tools)
		if u.Role == access.RoleConsole {
			u.Principals, u.Principal = splitList(u.Principal), ""
		}
		return authCreate(*file, u, out, accountSeed, catalogPath, prefix, stdout)
	case "list":
		return authList(*file, stdout)
	case "revoke":
		return authRevoke(*file, u.Name, stdout)
	default:
		return authPermissions(*file, catalogPath, prefix, format, u.Name, stdout)
	}
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func authCreate(file string, u access.User, out, accountSeed, catalogPath, prefix string, stdout io.Writer) error {
	f, err := access.LoadOrEmpty(file)
	if err != nil {
		return failf("%v", err)
	}
	if _, ok := f.Find(u.Name); ok {
		return failf("auth create: user %s exists in %s (revoke it first)", u.Name, file)
	}
	made, creds, err := access.NewUser(u.Name, u.Role)
	if err != nil {
		return failf("auth create: %v", err)
	}
	u.NKey = made.NKey
	if err := u.Check(); err != nil {
		return usageErrorf("auth create: %v", err)
	}
	if accountSeed != "" {
		layout, err := loadLayout(catalogPath, prefix)
		if err != nil {
			return err
		}
		if creds, err = signedCreds(u, creds, accountSeed, layout); err != nil {
			return failf("auth create: %v", err)
		}
	}
	if out == "" {
		out = u.Name + ".creds"
	}
	f.Users = append(f.Users, u)
	if err := access.WriteCreds(out, creds); err != nil {
		return failf("auth create: %v", err)
	}
	if err := f.Save(file); err != nil {
		os.Remove(out)
		return failf("auth create: %v", err)
	}
	fmt.Fprintf(stdout, "user %s (role %s) added to %s; credentials in %s (keep them secret); a running engine takes the user on SIGHUP\n",
		u.Name, u.Role, file, out)
	return nil
}

// signedCreds makes a NATS .creds file: the user's JWT, with the role's
// permissions, signed by the account, and the user's seed.
func signedCreds(u access.User, seedFile []byte, accountSeed string, layout access.Layout) ([]byte, error) {
	data, err := os.ReadFile(accountSeed)
	if err != nil {
		return nil, err
	}
	akp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return nil, fmt.Errorf("--account-seed: %w", err)
	}
	ukp, err := nkeys.ParseDecoratedUserNKey(seedFile)
	if err != nil {
		return nil, err
	}
	seed, err := ukp.Seed()
	if err != nil {
		return nil, err
	}
	p, err := layout.Permissions(u)
	if err != nil {
		return nil, err
	}
	token, err := access.UserClaims(u, p).Encode(akp)
	if err != nil {
		return nil, err
	}
	return jwt.FormatUserConfig(token, seed)
}

func authList(file string, stdout io.Writer) error {
	f, err := access.LoadFile(file)
	if err != nil {
		return failf("%v", err)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tROLE\tSCOPE\tNKEY")
	for _, u := range f.Users {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", u.Name, u.Role, scope(u), u.NKey)
	}
	return tw.Flush()
}

func scope(u access.User) string {
	switch {
	case len(u.Pools) > 0:
		return "pools " + strings.Join(u.Pools, ",")
	case u.Principal != "":
		return "principal " + u.Principal
	case len(u.Principals) > 0:
		return "principals " + strings.Join(u.Principals, ",")
	case len(u.Tools) > 0:
		return "tools " + strings.Join(u.Tools, ",")
	case u.Resume:
		return "unattributed resumes"
	}
	return "-"
}

func authRevoke(file, name string, stdout io.Writer) error {
	f, err := access.LoadFile(file)
	if err != nil {
		return failf("%v", err)
	}
	if !f.Remove(name) {
		return failf("auth revoke: no user %q in %s", name, file)
	}
	if err := f.Save(file); err != nil {
		return failf("auth revoke: %v", err)
	}
	fmt.Fprintf(stdout, "user %s removed from %s; send the engine SIGHUP to close its connections\n", name, file)
	return nil
}

func authPermissions(file, catalogPath, prefix, format, name string, stdout io.Writer) error {
	f, err := access.LoadFile(file)
	if err != nil {
		return failf("%v", err)
	}
	layout, err := loadLayout(catalogPath, prefix)
	if err != nil {
		return err
	}
	var users []access.User
	for _, u := range f.Users {
		if name == "" || u.Name == name {
			users = append(users, u)
		}
	}
	if len(users) == 0 {
		return failf("auth permissions: no user %q in %s", name, file)
	}
	switch format {
	case "server":
		if err := access.ServerConfig(stdout, layout, users, filepath.Base(file)); err != nil {
			return failf("%v", err)
		}
	case "jwt":
		for _, u := range users {
			p, err := layout.Permissions(u)
			if err != nil {
				return failf("%v", err)
			}
			b, _ := json.MarshalIndent(access.UserClaims(u, p), "", "  ")
			fmt.Fprintf(stdout, "%s\n", b)
		}
	default:
		return usageErrorf("auth permissions: --format %q: want server or jwt", format)
	}
	return nil
}

// loadLayout is the subject layout of prefix, with the sandbox tools of
// the catalog at catalogPath (none without one).
func loadLayout(catalogPath, prefix string) (access.Layout, error) {
	layout := access.Layout{Names: protocol.Names{Prefix: prefix}}
	if catalogPath != "" {
		cat, err := catalog.Load(catalogPath)
		if err != nil {
			return layout, failf("%v", err)
		}
		layout.PoolTools = cat.PoolTools()
	}
	return layout, nil
}
