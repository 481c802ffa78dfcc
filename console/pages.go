package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolbatch/toolbatch/audit"
	"github.com/toolbatch/toolbatch/events"
	"github.com/toolbatch/toolbatch/protocol"
	"github.com/toolbatch/toolbatch/replay"
)

// fragmentHeader asks for a page's main part only (the live update).
const fragmentHeader = "X-Console-Fragment"

// view is what every page template gets.
type view struct {
	Title     string
	Nav       string // the active tab
	User      *User
	CSRF      string
	Flashes   []flash
	Live      string // the topics the page reloads on: "runs", "tickets", "run:<id>"
	Since     uint64 // the change notices the page's data has seen (hub.go)
	Approvals int    // open permission tickets (the tab's badge)
	Waits     int
	Ready     bool
	Now       time.Time
	Data      any
}

var pageNames = []string{"signin", "runs", "run", "approvals", "waits", "audit"}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"since":    since,
		"until":    until,
		"rfc3339":  func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"clock":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") },
		"pretty":   prettyJSON,
		"query":    func(k, v string) string { return url.Values{k: {v}}.Encode() },
		"add":      func(a, b int) int { return a + b },
		"deadline": func(s string) time.Time { t, _ := time.Parse(time.RFC3339Nano, s); return t },
	}
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// render writes a page, or its main part only when the page's script asks
// for the live update.
func (s *Server) render(w http.ResponseWriter, r *http.Request, x *session, name string, v view) {
	v.Now = s.cfg.Now()
	v.Ready = s.Ready()
	v.Since, _ = r.Context().Value(generationKey{}).(uint64)
	if x != nil {
		u := x.user
		v.User, v.CSRF = &u, x.csrf
		if r.Header.Get(fragmentHeader) == "" {
			v.Flashes = s.sessions.takeFlashes(x)
		}
	}
	v.Approvals = len(s.tickets.list(string(events.WaitPermission)))
	v.Waits = len(s.tickets.list(waitReasons...))
	tmpl := "layout.html"
	if r.Header.Get(fragmentHeader) != "" {
		tmpl = "content"
	}
	var b bytes.Buffer
	if err := s.pages[name].ExecuteTemplate(&b, tmpl, v); err != nil {
		s.log.Error().Err(err).Str("page", name).Msg("console: render")
		http.Error(w, "the page could not be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b.Bytes())
}

// waitReasons are the tickets of the waits page: no person approves them.
var waitReasons = []string{string(events.WaitScheduledAction), string(events.WaitExternalResult), string(events.WaitDelegation)}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }

// safeNext keeps a sign-in's return address on this console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/approvals"
	}
	return next
}

func (s *Server) signInPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, nil, "signin", view{Title: "Sign in", Data: map[string]string{"Next": safeNext(r.URL.Query().Get("next"))}})
}

func (s *Server) signIn(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		http.Error(w, "refused: a cross-site request", http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	next := safeNext(r.PostFormValue("next"))
	t, err := s.sessions.signIn(s.cfg.Users, r.PostFormValue("name"), r.PostFormValue("password"), s.cfg.Now())
	if err != nil {
		w.WriteHeader(http.StatusUnauthorized)
		s.render(w, r, nil, "signin", view{Title: "Sign in", Flashes: []flash{{Kind: "error", Text: err.Error()}},
			Data: map[string]string{"Next": next, "Name": r.PostFormValue("name")}})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: t, Path: "/", HttpOnly: true, Secure: s.cfg.Secure,
		SameSite: http.SameSiteStrictMode, MaxAge: int(sessionTTL / time.Second)})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) signOut(w http.ResponseWriter, r *http.Request, _ *session) {
	if c, err := r.Cookie(cookieName); err == nil {
		s.sessions.signOut(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: s.cfg.Secure, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// runsData is the runs page's.
type runsData struct {
	State, Q string
	States   []string
	Counts   map[string]int
	Page
	Prev, Next string // links, "" when none
}

func (s *Server) runsPage(w http.ResponseWriter, r *http.Request, x *session) {
	q := r.URL.Query()
	state := q.Get("state")
	if !slices.Contains([]string{StateAll, StateRunning, StateParked, StateEnded}, state) {
		state = StateAll
	}
	search := strings.TrimSpace(q.Get("q"))
	n, _ := strconv.Atoi(q.Get("page"))
	d := runsData{State: state, Q: search, States: []string{StateAll, StateRunning, StateParked, StateEnded}, Counts: s.index.counts(),
		Page: s.index.query(state, search, n)}
	link := func(page int) string {
		return "/runs?" + url.Values{"state": {state}, "q": {search}, "page": {strconv.Itoa(page)}}.Encode()
	}
	if d.Page.Page > 1 {
		d.Prev = link(d.Page.Page - 1)
	}
	if d.Page.Page < d.Pages {
		d.Next = link(d.Page.Page + 1)
	}
	s.render(w, r, x, "runs", view{Title: "Runs", Nav: "runs", Live: "runs", Data: d})
}

// entry is one line of a timeline: an event or a note of the fold.
type entry struct {
	Seq       uint64
	At        time.Time
	What      string
	Text      string
	Note      bool
	Recovery  bool // an attempt after the first, an indeterminate call, a refused result
	EventType string
}

// callView is one call of a batch on the run page.
type callView struct {
	replay.CallState
	Arguments   string
	Invalid     string
	Timeline    []entry
	Output      string // the completed call's output, as JSON
	IsError     bool
	Staged      []string
	Disposition string // the latest out message's
	Gate        string
}

// batchView is one batch on the run page.
type batchView struct {
	replay.BatchLine
	Calls     []callView
	Items     []entry // the batch's own events (submitted, finalized)
	Results   string  // the published results, as JSON
	State     []string
	Conflict  string
	Finalized bool
}

// rawCommit is one commit as stored.
type rawCommit struct {
	Seq     uint64
	Subject string
	At      time.Time
	Types   string
	JSON    string
}

type runData struct {
	ID      string
	Summary RunSummary
	Known   bool
	Line    *replay.RunLine
	Batches []batchView
	Items   []entry
	Ticket  *protocol.AwaitingOut
	Raw     []rawCommit
	Ended   bool
}

func (s *Server) runPage(w http.ResponseWriter, r *http.Request, x *session) {
	runID := r.PathValue("run")
	if !events.ValidRunID(runID) {
		http.Error(w, "a run id matches [A-Za-z0-9_-]{1,64}", http.StatusBadRequest)
		return
	}
	d, err := s.readRun(r.Context(), runID)
	if err != nil {
		http.Error(w, "reading run "+runID+": "+err.Error(), http.StatusBadGateway)
		return
	}
	s.render(w, r, x, "run", view{Title: "Run " + runID, Nav: "runs", Live: topicRun + runID, Data: d})
}

// readRun reads one run's commits and out dispositions and folds them as
// replay history does.
func (s *Server) readRun(ctx context.Context, runID string) (*runData, error) {
	d := &runData{ID: runID}
	d.Summary, d.Known = s.index.summary(runID)
	if t, ok := s.tickets.byRunID(runID); ok {
		d.Ticket = &t
	}
	h := replay.NewHistory(s.names.Prefix, false)
	src := replay.NewNATSSource(s.js, s.names.Prefix)
	err := src.Read(ctx, replay.EventsStream, replay.Selection{Run: runID}, true, func(m *replay.Message) error {
		h.Add(m)
		evs, derr := m.Commit()
		rc := rawCommit{Seq: m.Seq, Subject: m.Subject, At: m.Time}
		if derr != nil {
			rc.JSON = "undecodable: " + derr.Error()
		} else {
			types := make([]string, len(evs))
			for i, e := range evs {
				types[i] = string(e.EventType())
			}
			rc.Types = strings.Join(types, ", ")
			b, _ := json.MarshalIndent(evs, "", "  ")
			rc.JSON = string(b)
		}
		d.Raw = append(d.Raw, rc)
		return nil
	})
	if err != nil {
		return nil, err
	}
	h.Finish()
	disp := map[string]string{} // batch/call -> disposition
	if err := s.readOut(ctx, runID, func(o protocol.DispositionOut) {
		disp[o.BatchID+"\x00"+o.CallID] = string(o.Disposition)
	}); err != nil {
		return nil, err
	}
	var cur *batchView
	byCall := map[string]int{}
	h.Lines(func(line any) {
		switch l := line.(type) {
		case replay.RunLine:
			d.Line = &l
			d.Ended = l.Status == "ended"
		case replay.BatchLine:
			d.Batches = append(d.Batches, batchView{BatchLine: l})
			cur = &d.Batches[len(d.Batches)-1]
			clear(byCall)
			for i, c := range l.Calls {
				cur.Calls = append(cur.Calls, callView{CallState: c, Disposition: disp[l.Batch+"\x00"+c.CallID]})
				byCall[c.CallID] = i
			}
		case replay.EventLine:
			e := entry{Seq: l.Seq, At: l.At, What: l.What, Text: l.Text, EventType: string(l.EventType)}
			if l.Batch == "" || cur == nil || cur.Batch != l.Batch {
				d.Items = append(d.Items, e)
				return
			}
			describeEvent(cur, byCall, l.Event, &e)
			if i, ok := byCall[l.Call]; ok && l.Call != "" {
				cur.Calls[i].Timeline = append(cur.Calls[i].Timeline, e)
			} else {
				cur.Items = append(cur.Items, e)
			}
		case replay.NoteLine:
			e := entry{Seq: l.Seq, At: l.Time, What: "note", Text: l.Text, Note: true}
			if cur != nil && l.Batch == cur.Batch {
				cur.Items = append(cur.Items, e)
			} else {
				d.Items = append(d.Items, e)
			}
		}
	})
	// Newest batch first: the one a person looks for.
	slices.Reverse(d.Batches)
	return d, nil
}

// describeEvent fills what the run page shows of an event beyond its
// timeline line: a call's arguments, output, staged state, gate; a
// batch's results.
func describeEvent(b *batchView, byCall map[string]int, ev events.Event, e *entry) {
	call := func(id string) *callView {
		if i, ok := byCall[id]; ok {
			return &b.Calls[i]
		}
		return nil
	}
	switch x := ev.(type) {
	case *events.BatchSubmitted:
		for _, c := range x.Calls {
			if cv := call(c.CallID); cv != nil {
				cv.Arguments, cv.Invalid = prettyJSON(c.Arguments), c.Invalid
			}
		}
	case *events.CallGated:
		if cv := call(x.CallID); cv != nil {
			cv.Gate = e.Text
		}
	case *events.CallExecuting:
		e.Recovery = x.Attempt > 1
	case *events.CallIndeterminate, *events.ResultRefused:
		e.Recovery = true
	case *events.CallCompleted:
		if cv := call(x.CallID); cv != nil {
			cv.Output, cv.IsError = prettyValue(x.Output.Content), x.Output.IsError
			cv.Staged = nil
			for _, c := range x.Output.State {
				cv.Staged = append(cv.Staged, events.DescribeCommand(c))
			}
		}
	case *events.BatchFinalized:
		b.Finalized, b.Results, b.Conflict = true, prettyValue(x.Results), x.Conflict
		for _, c := range x.State {
			b.State = append(b.State, events.DescribeCommand(c))
		}
	}
}

// readOut reads a run's disposition messages, in order, up to the out
// stream's end.
func (s *Server) readOut(ctx context.Context, runID string, fn func(protocol.DispositionOut)) error {
	return protocol.ReadOrdered(ctx, s.js, s.names.OutStream(), protocol.ReadOptions{Subjects: []string{s.names.Out(runID, protocol.OutDisposition)}},
		func(m jetstream.Msg, _ *jetstream.MsgMetadata) error {
			var o protocol.DispositionOut
			if err := events.Unmarshal(m.Data(), &o); err == nil {
				fn(o)
			}
			return nil
		})
}

func (s *Server) postControl(w http.ResponseWriter, r *http.Request, x *session) {
	runID := r.PathValue("run")
	back := "/runs/" + url.PathEscape(runID)
	action := protocol.ControlAction(r.PostFormValue("action"))
	if !events.ValidRunID(runID) || (action != protocol.ControlCancel && action != protocol.ControlInterrupt) {
		http.Error(w, "want a run id and action cancel or interrupt", http.StatusBadRequest)
		return
	}
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		reason = "by " + x.user.Principal + " in the console"
	}
	s.sessions.addFlash(x, s.control(r.Context(), runID, protocol.Control{Action: action, Reason: reason}))
	http.Redirect(w, r, back, http.StatusSeeOther)
}

// ticketView is one open ticket with what the gate said about it.
type ticketView struct {
	protocol.AwaitingOut
	Key       string // run|correlation: the form's value
	Arguments string
	Rule      string
	Reason    string
	Stage     string
	Deadline  time.Time
	Due       time.Time
}

func (s *Server) ticketViews(reasons ...string) []ticketView {
	var out []ticketView
	for _, t := range s.tickets.list(reasons...) {
		v := ticketView{AwaitingOut: t, Key: t.RunID + "|" + t.CorrelationID, Arguments: prettyJSON(t.Arguments), Deadline: deadlineOf(t)}
		v.Due, _ = time.Parse(time.RFC3339Nano, t.Due)
		if g := s.index.gate(t.RunID, t.CorrelationID); g != nil {
			v.Rule, v.Reason, v.Stage = g.Rule, g.Reason, string(g.Stage)
		}
		out = append(out, v)
	}
	return out
}

func (s *Server) approvalsPage(w http.ResponseWriter, r *http.Request, x *session) {
	s.render(w, r, x, "approvals", view{Title: "Approvals", Nav: "approvals", Live: topicTickets,
		Data: map[string]any{"Tickets": s.ticketViews(string(events.WaitPermission)), "Problems": s.tickets.problems()}})
}

// postAnswers answers one ticket (the button of its row: one=approve|KEY)
// or every selected one (bulk=approve with the ticket checkboxes), each
// with its own note or the bulk note.
func (s *Server) postAnswers(w http.ResponseWriter, r *http.Request, x *session) {
	type pick struct {
		key   string
		allow bool
	}
	var picks []pick
	if one := r.PostFormValue("one"); one != "" {
		verb, key, _ := strings.Cut(one, "|")
		picks = append(picks, pick{key: key, allow: verb == "approve"})
		if verb != "approve" && verb != "deny" {
			http.Error(w, "want approve or deny", http.StatusBadRequest)
			return
		}
	} else {
		verb := r.PostFormValue("bulk")
		if verb != "approve" && verb != "deny" {
			http.Error(w, "want approve or deny", http.StatusBadRequest)
			return
		}
		for _, key := range r.PostForm["ticket"] {
			picks = append(picks, pick{key: key, allow: verb == "approve"})
		}
		if len(picks) == 0 {
			s.sessions.addFlash(x, flash{Kind: "error", Text: "Nothing selected: tick the tickets to answer first."})
		}
	}
	for _, p := range picks {
		runID, corr, ok := strings.Cut(p.key, "|")
		if !ok || !events.ValidRunID(runID) {
			s.sessions.addFlash(x, flash{Kind: "error", Text: fmt.Sprintf("%q names no ticket.", p.key)})
			continue
		}
		note := strings.TrimSpace(r.PostFormValue("note-" + p.key))
		if note == "" && r.PostFormValue("one") == "" {
			note = strings.TrimSpace(r.PostFormValue("bulk-note"))
		}
		t, open := s.tickets.get(runID, corr)
		if !open {
			// Not open as far as this console has read: the engine is
			// still asked, and its refusal is what the person sees.
			t = protocol.AwaitingOut{RunID: runID, CorrelationID: corr, CallID: r.PostFormValue("call-" + p.key),
				ThreadID: r.PostFormValue("thread-" + p.key), SnapshotID: r.PostFormValue("snapshot-" + p.key), ToolID: r.PostFormValue("tool-" + p.key)}
		}
		s.sessions.addFlash(x, s.answer(r.Context(), t, x.user.Principal, p.allow, note))
	}
	http.Redirect(w, r, "/approvals", http.StatusSeeOther)
}

func (s *Server) waitsPage(w http.ResponseWriter, r *http.Request, x *session) {
	s.render(w, r, x, "waits", view{Title: "Waits", Nav: "waits", Live: topicTickets,
		Data: map[string]any{
			"Scheduled": s.ticketViews(string(events.WaitScheduledAction)),
			"Client":    s.ticketViews(string(events.WaitExternalResult)),
			"Delegated": s.ticketViews(string(events.WaitDelegation)),
		}})
}

func (s *Server) postPerform(w http.ResponseWriter, r *http.Request, x *session) {
	runID, corr := r.PostFormValue("run"), r.PostFormValue("correlation")
	if !events.ValidRunID(runID) || corr == "" {
		http.Error(w, "want a run and a correlation id", http.StatusBadRequest)
		return
	}
	s.sessions.addFlash(x, s.control(r.Context(), runID, protocol.Control{Action: protocol.ControlPerform, CorrelationID: corr}))
	http.Redirect(w, r, "/waits", http.StatusSeeOther)
}

type auditData struct {
	Run        string
	Ran        bool
	Err        string
	Report     replay.AuditReport
	Violations []audit.Violation
	Verified   bool
}

func (s *Server) auditPage(w http.ResponseWriter, r *http.Request, x *session) {
	q := r.URL.Query()
	d := auditData{Run: strings.TrimSpace(q.Get("run")), Verified: s.cfg.Keys != nil}
	if q.Get("go") != "" {
		d.Ran = true
		if d.Run != "" && !events.ValidRunID(d.Run) {
			d.Err = "a run id matches [A-Za-z0-9_-]{1,64}"
		} else if rep, err := s.audit(r.Context(), d.Run); err != nil {
			d.Err = err.Error()
		} else {
			d.Report, d.Violations = rep, rep.Violations
		}
	}
	s.render(w, r, x, "audit", view{Title: "Audit", Nav: "audit", Data: d})
}

// audit runs replay audit over the log, or over one run.
func (s *Server) audit(ctx context.Context, runID string) (replay.AuditReport, error) {
	src := replay.NewNATSSource(s.js, s.names.Prefix)
	return replay.Audit(ctx, src, s.names.Prefix, replay.Selection{Run: runID}, s.cfg.Keys, nil, nil)
}

// prettyJSON indents JSON text (as it is when it is not JSON).
func prettyJSON(raw []byte) string {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return string(raw)
	}
	return b.String()
}

func prettyValue(v any) string {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// since and until say how long ago or ahead a time is, for people.
func since(now, t time.Time) string { return human(now.Sub(t)) + " ago" }

func until(now, t time.Time) string {
	d := t.Sub(now)
	if d < 0 {
		return "passed " + human(-d) + " ago"
	}
	return "in " + human(d)
}

func human(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
