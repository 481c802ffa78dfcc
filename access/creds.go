package access

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// NewUser creates a user's key pair: the entry for the auth file and the
// credentials file's content (the decorated seed: the user's secret).
func NewUser(name string, role Role) (User, []byte, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return User{}, nil, err
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return User{}, nil, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return User{}, nil, err
	}
	return User{Name: name, Role: role, NKey: pub}, formatSeed(name, role, seed), nil
}

func formatSeed(name string, role Role, seed []byte) []byte {
	return seedFile(fmt.Sprintf("toolbatch credentials of user %s (role %s): a secret, keep it 0600", name, role), seed)
}

// seedFile is a decorated user nkey seed under a comment line.
func seedFile(comment string, seed []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s\n", comment)
	b.WriteString("-----BEGIN USER NKEY SEED-----\n")
	b.Write(seed)
	b.WriteString("\n------END USER NKEY SEED------\n")
	return b.Bytes()
}

// WriteCreds writes a credentials file, mode 0600, refusing to replace an
// existing file.
func WriteCreds(path string, content []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("credentials file: %w", err)
	}
	if _, err := f.Write(content); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Conn is how a program reaches NATS: its credentials and TLS files, from
// the flags every program takes.
type Conn struct {
	// Creds is a credentials file: a user nkey seed written by toolbatch
	// auth, or a NATS .creds file (a user JWT and its seed) for a
	// decentralized setup.
	Creds string
	// TLSCA is the CA that signed the server's certificate.
	TLSCA string
	// TLSCert and TLSKey are a client certificate, for a server that
	// requires mutual TLS.
	TLSCert, TLSKey string
}

// Options returns the nats options of c: authentication, the user's own
// inbox prefix and TLS. Without credentials the connection is anonymous
// (a server without --auth).
func (c Conn) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if c.Creds != "" {
		data, kp, err := c.user()
		if err != nil {
			return nil, err
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("--creds %s: %w", c.Creds, err)
		}
		if bytes.Contains(data, []byte("BEGIN NATS USER JWT")) {
			opts = append(opts, nats.UserCredentials(c.Creds))
		} else {
			opts = append(opts, nats.Nkey(pub, kp.Sign))
		}
		opts = append(opts, nats.CustomInboxPrefix(InboxPrefix(pub)))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return nil, errors.New("--tls-client-cert and --tls-client-key go together")
	}
	if c.TLSCA != "" {
		if _, err := os.Stat(c.TLSCA); err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	return opts, nil
}

// PublicKey is the public nkey of the credentials' user ("" without
// credentials): the client of its attributed submissions.
func (c Conn) PublicKey() (string, error) {
	if c.Creds == "" {
		return "", nil
	}
	_, kp, err := c.user()
	if err != nil {
		return "", err
	}
	defer kp.Wipe()
	return kp.PublicKey()
}

// user reads the credentials file and the user's key pair in it.
func (c Conn) user() ([]byte, nkeys.KeyPair, error) {
	data, err := os.ReadFile(c.Creds)
	if err != nil {
		return nil, nil, fmt.Errorf("--creds: %w", err)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		return nil, nil, fmt.Errorf("--creds %s: no user nkey seed in it: %w", c.Creds, err)
	}
	return data, kp, nil
}

// Identity is a user key pair held in memory: the engine's own user of
// its embedded server, made at start, so that it needs no file.
type Identity struct {
	kp  nkeys.KeyPair
	Pub string
}

// NewIdentity makes a fresh user key pair.
func NewIdentity() (*Identity, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, err
	}
	return &Identity{kp: kp, Pub: pub}, nil
}

// Options authenticates as the identity, with its own inbox prefix.
func (id *Identity) Options() []nats.Option {
	return []nats.Option{nats.Nkey(id.Pub, id.kp.Sign), nats.CustomInboxPrefix(InboxPrefix(id.Pub))}
}

// Flags registers the connection flags every program takes.
func (c *Conn) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Creds, "creds", "", "credentials file of this program's NATS user (toolbatch auth create)")
	fs.StringVar(&c.TLSCA, "tls-ca", "", "CA certificate that signed the NATS server's certificate")
	fs.StringVar(&c.TLSCert, "tls-client-cert", "", "client certificate, for a server that requires mutual TLS")
	fs.StringVar(&c.TLSKey, "tls-client-key", "", "client certificate's key")
}

// ServiceOptions are the connection options of the long-lived programs
// (the engine, a sandbox worker): reconnect forever, and find a stalled
// server (a paused process, a host that stopped answering) within about
// three seconds, by pings every second of which three may go unanswered,
// instead of nats.go's four minutes; then move to another server of the
// cluster at once. name names the connection in the server's monitoring.
func ServiceOptions(name string) []nats.Option {
	return []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.PingInterval(time.Second), nats.MaxPingsOutstanding(3),
		nats.ReconnectWait(250 * time.Millisecond), nats.ReconnectJitter(100*time.Millisecond, 500*time.Millisecond)}
}

// SigningKey reads the key pair an engine signs its commits with from a
// seed file: a credentials file of toolbatch auth, a NATS .creds file, or
// a signing key file this function wrote. With create, a missing file is
// made (a new key, mode 0600).
func SigningKey(path string, create bool) (nkeys.KeyPair, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && create {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, err
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, err
		}
		pub, _ := kp.PublicKey()
		content := seedFile(fmt.Sprintf("toolbatch engine signing key %s: a secret, keep it 0600; pin its public key (replay audit --keys)", pub), seed)
		if err := WriteCreds(path, content); err != nil {
			return nil, fmt.Errorf("signing key: %w", err)
		}
		return kp, nil
	}
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: no user nkey seed in it: %w", path, err)
	}
	return kp, nil
}
