package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"

	"github.com/toolbatch/toolbatch/events"
)

// User is a person who may sign in to the console, and the principal
// their answers are attributed to.
type User struct {
	Name      string `yaml:"name"`
	Principal string `yaml:"principal"`
	// Password is the bcrypt hash of the user's password.
	Password string `yaml:"password"`
}

// Users is a console users file (toolbatch console user).
type Users struct {
	Users []User `yaml:"users"`
}

// MinPassword is the shortest password a user may be given.
const MinPassword = 12

// LoadUsers reads and checks a users file.
func LoadUsers(path string) (*Users, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("users file: %w", err)
	}
	var u Users
	if err := yaml.Unmarshal(data, &u); err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	if err := u.Check(); err != nil {
		return nil, fmt.Errorf("users file %s: %w", path, err)
	}
	return &u, nil
}

// LoadUsersOrEmpty reads a users file, or returns no users when it does
// not exist.
func LoadUsersOrEmpty(path string) (*Users, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return &Users{}, nil
	}
	return LoadUsers(path)
}

// Check reports the first problem of the file: a name or principal that
// is not an id, a name given twice, a password that is not a bcrypt hash.
func (u *Users) Check() error {
	seen := map[string]bool{}
	for i, x := range u.Users {
		if !events.ValidToolID(x.Name) {
			return fmt.Errorf("user %d: name %q must match [A-Za-z0-9_-]{1,64}", i+1, x.Name)
		}
		if seen[x.Name] {
			return fmt.Errorf("user %s is listed twice", x.Name)
		}
		seen[x.Name] = true
		if !events.ValidToolID(x.Principal) {
			return fmt.Errorf("user %s: principal %q must match [A-Za-z0-9_-]{1,64}", x.Name, x.Principal)
		}
		if _, err := bcrypt.Cost([]byte(x.Password)); err != nil {
			return fmt.Errorf("user %s: password is not a bcrypt hash (set it with toolbatch console user)", x.Name)
		}
	}
	return nil
}

// Principals lists the principals of the users, each once, sorted: what
// the console's NATS credential must serve.
func (u *Users) Principals() []string {
	var out []string
	for _, x := range u.Users {
		out = append(out, x.Principal)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Set adds a user or replaces the password and principal of one.
func (u *Users) Set(name, principal, password string) error {
	if len(password) < MinPassword {
		return fmt.Errorf("a password has at least %d characters", MinPassword)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	x := User{Name: name, Principal: principal, Password: string(hash)}
	if i := slices.IndexFunc(u.Users, func(y User) bool { return y.Name == name }); i >= 0 {
		u.Users[i] = x
	} else {
		u.Users = append(u.Users, x)
	}
	return u.Check()
}

// Save writes the file (mode 0600: it holds password hashes).
func (u *Users) Save(path string) error {
	data, err := yaml.Marshal(u)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// find returns the user who signs in with name and password (nil when
// none): the same work is done for an unknown name, so that the time
// taken does not tell which names exist.
func (u *Users) find(name, password string) *User {
	hash := dummyHash
	var found *User
	for i := range u.Users {
		if u.Users[i].Name == name {
			found, hash = &u.Users[i], []byte(u.Users[i].Password)
		}
	}
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil {
		return nil
	}
	return found
}

var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("not anyone's password"), bcrypt.DefaultCost)

// session is a signed-in user's.
type session struct {
	user    User
	csrf    string
	expires time.Time
	flashes []flash
}

// flash is a message shown once, on the next page the user sees.
type flash struct {
	Kind string // "ok" or "refused" or "error"
	Text string
}

// sessions are kept in memory: a console restart signs everyone out.
type sessions struct {
	mu       sync.Mutex
	byToken  map[string]*session
	ttl      time.Duration
	failures map[string]*attempts // by user name
}

type attempts struct {
	n     int
	until time.Time
}

const (
	cookieName   = "toolbatch_console"
	sessionTTL   = 12 * time.Hour
	maxFailures  = 5
	lockedFor    = time.Minute
	tokenBytes   = 32
	csrfField    = "csrf"
	headerOrigin = "Origin"
)

func newSessions() *sessions {
	return &sessions{byToken: map[string]*session{}, ttl: sessionTTL, failures: map[string]*attempts{}}
}

func token() string {
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// signIn checks a name and password; after maxFailures wrong passwords
// for a name, it refuses that name for lockedFor.
func (s *sessions) signIn(users *Users, name, password string, now time.Time) (string, error) {
	s.mu.Lock()
	a := s.failures[name]
	if a != nil && now.Before(a.until) {
		s.mu.Unlock()
		return "", fmt.Errorf("too many wrong passwords for %s: try again in a minute", name)
	}
	s.mu.Unlock()
	u := users.find(name, password)
	s.mu.Lock()
	defer s.mu.Unlock()
	if u == nil {
		if len(s.failures) > 10000 {
			clear(s.failures) // bounded: a flood of names forgets the counts
		}
		a := s.failures[name]
		if a == nil {
			a = &attempts{}
			s.failures[name] = a
		}
		if a.n++; a.n >= maxFailures {
			a.n, a.until = 0, now.Add(lockedFor)
		}
		return "", errors.New("wrong name or password")
	}
	delete(s.failures, name)
	for t, x := range s.byToken {
		if now.After(x.expires) {
			delete(s.byToken, t)
		}
	}
	t := token()
	s.byToken[t] = &session{user: *u, csrf: token(), expires: now.Add(s.ttl)}
	return t, nil
}

func (s *sessions) get(t string, now time.Time) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.byToken[t]
	if x == nil || now.After(x.expires) {
		delete(s.byToken, t)
		return nil
	}
	return x
}

func (s *sessions) signOut(t string) {
	s.mu.Lock()
	delete(s.byToken, t)
	s.mu.Unlock()
}

func (s *sessions) addFlash(x *session, f flash) {
	s.mu.Lock()
	x.flashes = append(x.flashes, f)
	s.mu.Unlock()
}

func (s *sessions) takeFlashes(x *session) []flash {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := x.flashes
	x.flashes = nil
	return f
}

// sameOrigin reports whether a POST comes from the console's own pages:
// a browser sends Origin with every POST (and Sec-Fetch-Site); a request
// from another site's page names that site. A request without either is
// not a browser's, and is held to the CSRF token alone.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	o := r.Header.Get(headerOrigin)
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// validCSRF compares a form's token with the session's in constant time.
func validCSRF(x *session, got string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(x.csrf), []byte(got)) == 1
}
