package catalog

import (
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
	"sync"
	"time"

	"cel.dev/cel-go/cel"

	"github.com/toolbatch/toolbatch/events"
)

// Decision is the policy stage's decision for one call (stage b of the gate
// chain). The engine runs the narrowing before it and the external gate
// after it when it allows.
type Decision struct {
	// Matched reports whether a rule decided; false means no rule matched
	// and the outcome is allow.
	Matched bool
	// Rule names the rule that decided, such as "gate.rules[1]", for the
	// audit; empty when none matched.
	Rule    string
	Outcome events.GateOutcome
	// Reason is the block reason: the rule's reason, or
	// "policy error: <message>" when its when expression failed.
	Reason string
	// Output is the set_result output (a fresh copy; CallID is empty).
	Output *events.Output
	// Deadline is when a require_confirmation ticket expires (now plus the
	// rule's deadline); nil when it never expires.
	Deadline *time.Time
	// Due is when a scheduled call is performed: now plus after, or at.
	Due *time.Time
	// ActionKind labels a scheduled action.
	ActionKind string
}

// PolicyErrorPrefix starts the block reason of a rule whose when expression
// failed when evaluated.
const PolicyErrorPrefix = "policy error: "

// rule is one compiled gate rule.
type rule struct {
	name       string // gate.rules[i]
	globs      []string
	when       string
	prg        cel.Program // nil without when
	outcome    events.GateOutcome
	reason     string
	output     *events.Output
	deadline   time.Duration // require_confirmation; 0: none
	after      *time.Duration
	at         *time.Time
	actionKind string
}

// matches reports whether a glob of the rule matches the tool id.
func (r *rule) matches(toolID string) bool {
	for _, g := range r.globs {
		if ok, _ := path.Match(g, toolID); ok {
			return true
		}
	}
	return false
}

// decide returns the rule's decision at now.
func (r *rule) decide(now time.Time) Decision {
	d := Decision{Matched: true, Rule: r.name, Outcome: r.outcome}
	switch r.outcome {
	case events.GateBlock:
		d.Reason = r.reason
	case events.GateSetResult:
		d.Output = cloneOutput(r.output)
	case events.GateRequireConfirmation:
		if r.deadline > 0 {
			t := now.Add(r.deadline)
			d.Deadline = &t
		}
	case events.GateSchedule:
		var t time.Time
		if r.after != nil {
			t = now.Add(*r.after)
		} else {
			t = *r.at
		}
		d.Due = &t
		d.ActionKind = r.actionKind
	}
	return d
}

// Evaluate runs the policy rules for one call: the first rule whose glob
// matches toolID and whose when expression (if any) is true decides. No
// match: Matched false and Outcome allow.
//
// args is the call's arguments (a JSON object; empty or null is {}). state
// is the committed state visible to the run, keyed as the aggregate keys it
// (run.<run_id>.<key>, thread.<thread_id>.<key>, shared.<key>); its values
// are decoded JSON values (nil, bool, int64, uint64, float64, string, []any,
// map[string]any) or events.RawJSON, which is decoded. nil is an empty map.
//
// A when expression that fails (a missing key, a type error, a result that
// is not a bool, the cost limit, arguments that are not an object) decides
// block with the reason "policy error: <message>": the policy fails closed.
// Evaluate does no IO and reads no clock: deadlines and due times are
// computed from now.
func (c *Catalog) Evaluate(toolID string, args events.RawJSON, state map[string]any, now time.Time) Decision {
	var vars map[string]any
	var varsErr error
	for i := range c.rules {
		r := &c.rules[i]
		if !r.matches(toolID) {
			continue
		}
		if r.prg != nil {
			if vars == nil && varsErr == nil {
				vars, varsErr = activation(toolID, args, state)
			}
			if varsErr != nil {
				return policyError(r, varsErr)
			}
			ok, err := r.test(vars)
			if err != nil {
				return policyError(r, err)
			}
			if !ok {
				continue
			}
		}
		return r.decide(now)
	}
	return Decision{Outcome: events.GateAllow}
}

// policyError is the fail-closed decision of a rule whose when failed.
func policyError(r *rule, err error) Decision {
	return Decision{Matched: true, Rule: r.name, Outcome: events.GateBlock, Reason: PolicyErrorPrefix + err.Error()}
}

// test evaluates the rule's when expression.
func (r *rule) test(vars map[string]any) (bool, error) {
	val, _, err := r.prg.Eval(vars)
	if err != nil {
		return false, err
	}
	b, ok := val.Value().(bool)
	if !ok {
		return false, fmt.Errorf("when evaluated to %s, not bool", val.Type().TypeName())
	}
	return b, nil
}

// activation returns the CEL variables of one call.
func activation(toolID string, args events.RawJSON, state map[string]any) (map[string]any, error) {
	a := map[string]any{}
	v, err := args.Value()
	if err != nil {
		return nil, fmt.Errorf("arguments do not decode: %v", err)
	}
	switch x := v.(type) {
	case nil:
	case map[string]any:
		a = x
	default:
		return nil, errors.New("arguments are not a JSON object")
	}
	s := make(map[string]any, len(state))
	for k, v := range state {
		if raw, ok := v.(events.RawJSON); ok {
			dv, err := raw.Value()
			if err != nil {
				return nil, fmt.Errorf("state %q does not decode: %v", k, err)
			}
			v = dv
		}
		s[k] = v
	}
	return map[string]any{"tool_id": toolID, "args": a, "state": s}, nil
}

// celEnvT is the CEL environment of when expressions.
type celEnvT = *cel.Env

// celEnv returns the CEL environment: the standard library with the
// variables tool_id, args and state. It is built once.
var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable("tool_id", cel.StringType),
		cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("state", cel.MapType(cel.StringType, cel.DynType)),
	)
})

// compileWhen compiles a when expression and checks that it is bool (or
// dyn, checked when evaluated).
func compileWhen(env *cel.Env, expr string) (cel.Program, error) {
	ast, iss := env.Compile(expr)
	if iss != nil && iss.Err() != nil {
		msgs := make([]string, 0, len(iss.Errors()))
		for _, e := range iss.Errors() {
			msgs = append(msgs, fmt.Sprintf("%d:%d: %s", e.Location.Line(), e.Location.Column()+1, e.Message))
		}
		return nil, fmt.Errorf("CEL does not compile: %s", strings.Join(msgs, "; "))
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("CEL expression has type %s, want bool", t)
	}
	prg, err := env.Program(ast, cel.CostLimit(CELCostLimit))
	if err != nil {
		return nil, fmt.Errorf("CEL program: %v", err)
	}
	return prg, nil
}

// cloneOutput returns a deep copy, so that no caller can change the
// catalog's output.
func cloneOutput(o *events.Output) *events.Output {
	if o == nil {
		return nil
	}
	c := *o
	c.Content = cloneBlocks(o.Content)
	c.State = append([]events.Command(nil), o.State...)
	return &c
}

func cloneBlocks(bs []events.ContentBlock) []events.ContentBlock {
	if bs == nil {
		return nil
	}
	out := make([]events.ContentBlock, len(bs))
	for i, b := range bs {
		b.Input = append(events.RawJSON(nil), b.Input...)
		b.Value = append(events.RawJSON(nil), b.Value...)
		b.Content = cloneBlocks(b.Content)
		if b.Source != nil {
			s := *b.Source
			b.Source = &s
		}
		out[i] = b
	}
	return out
}

// mentionsState matches a when expression that may read the state variable.
var mentionsState = regexp.MustCompile(`\bstate\b`)

// UsesState reports whether a rule's when expression may read state, so
// that the engine reads the committed state only when a rule can see it. It
// is conservative: a rule that merely mentions the word counts.
func (c *Catalog) UsesState() bool {
	for _, r := range c.rules {
		if r.prg != nil && mentionsState.MatchString(r.when) {
			return true
		}
	}
	return false
}
