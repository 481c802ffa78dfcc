package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolbatch/toolbatch/console"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/internal/cli"
	"github.com/toolbatch/toolbatch/proof"
)

func cmdConsole(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "user" {
		return cmdConsoleUser(args[1:], stdin, stdout)
	}
	c := newCommon("console")
	users := c.fs.String("users", "", "the console's users file (toolbatch console user)")
	listen := c.fs.String("listen", "127.0.0.1:8080", "HTTP address")
	certFile := c.fs.String("tls-cert", "", "HTTPS: certificate file (PEM)")
	keyFile := c.fs.String("tls-key", "", "HTTPS: key file (PEM)")
	secureCookie := c.fs.Bool("secure-cookie", false, "mark the session cookie Secure (behind a TLS proxy)")
	keys := c.fs.String("keys", "", "pinned engine keys file: audits check the commits' signatures (toolbatch auth keys)")
	var logFlags cli.LogFlags
	logFlags.Flags(c.fs)
	if _, err := c.parse(args); err != nil {
		return err
	}
	if *users == "" {
		return usageErrorf("console: --users FILE is required (toolbatch console user --users FILE --name NAME adds one)")
	}
	if (*certFile == "") != (*keyFile == "") {
		return usageErrorf("console: --tls-cert and --tls-key go together")
	}
	if *certFile == "" && !loopback(*listen) {
		return usageErrorf("console: --listen %s is not a loopback address: serve it over HTTPS (--tls-cert, --tls-key), or listen on loopback behind a TLS proxy", *listen)
	}
	log, err := logFlags.Logger(stderr)
	if err != nil {
		return usageErrorf("console: %v", err)
	}
	u, err := console.LoadUsers(*users)
	if err != nil {
		return failf("console: %v", err)
	}
	cfg := console.Config{Prefix: c.prefix, Users: u, Secure: *secureCookie || *certFile != "", Log: log}
	if *keys != "" {
		if cfg.Keys, err = proof.LoadKeys(*keys); err != nil {
			return failf("console: %v", err)
		}
	}
	var tlsCfg *tls.Config
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return failf("console: TLS: %v", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	connOpts, err := c.conn.Options()
	if err != nil {
		return usageErrorf("%v", err)
	}
	nc, err := nats.Connect(c.natsURL, append(connOpts, nats.Name("toolbatch-console"), nats.MaxReconnects(-1))...)
	if err != nil {
		return failf("console: connect to %s: %v", c.natsURL, err)
	}
	defer nc.Close()
	cfg.NC = nc
	srv, err := console.New(cfg)
	if err != nil {
		return failf("%v", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return failf("console: listen %s: %v", *listen, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hs := &http.Server{Handler: srv.Handler(), TLSConfig: tlsCfg, ReadHeaderTimeout: 10 * time.Second}
	errs := make(chan error, 2)
	go func() { errs <- srv.Run(ctx) }()
	go func() {
		if tlsCfg != nil {
			errs <- hs.ServeTLS(ln, "", "")
		} else {
			errs <- hs.Serve(ln)
		}
	}()
	scheme := "http"
	if tlsCfg != nil {
		scheme = "https"
	}
	log.Info().Str("url", scheme+"://"+ln.Addr().String()).Strs("principals", u.Principals()).Msg("console ready")
	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	if runErr != nil && !errors.Is(runErr, http.ErrServerClosed) {
		return failf("console: %v", runErr)
	}
	return nil
}

// loopback reports whether an address listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func cmdConsoleUser(args []string, stdin io.Reader, stdout io.Writer) error {
	c := newCommon("console user")
	file := c.fs.String("users", "", "the console's users file")
	name := c.fs.String("name", "", "the user's name (what they sign in with)")
	principal := c.fs.String("principal", "", "the principal their answers are attributed to (default: the name)")
	if _, err := c.parse(args); err != nil {
		return err
	}
	if *file == "" || *name == "" {
		return usageErrorf("console user: --users FILE and --name NAME are required")
	}
	if *principal == "" {
		*principal = *name
	}
	if !events.ValidToolID(*name) || !events.ValidToolID(*principal) {
		return usageErrorf("console user: a name and a principal match [A-Za-z0-9_-]{1,64}")
	}
	line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return failf("console user: read the password from stdin: %v", err)
	}
	password := strings.TrimRight(line, "\r\n")
	u, err := console.LoadUsersOrEmpty(*file)
	if err != nil {
		return failf("console user: %v", err)
	}
	if err := u.Set(*name, *principal, password); err != nil {
		return failf("console user: %v", err)
	}
	if err := u.Save(*file); err != nil {
		return failf("console user: %v", err)
	}
	fmt.Fprintf(stdout, "user %s (principal %s) set in %s; the console's NATS credential must serve principals %s\n",
		*name, *principal, *file, strings.Join(u.Principals(), ","))
	return nil
}
