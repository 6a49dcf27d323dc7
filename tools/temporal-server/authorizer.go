package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/server/common/api"
	"go.temporal.io/server/common/authorization"
)

// Policy names the holders of triloop's service tokens; the rules below say what each may
// not do. Written by `dev up` from the settings (namespace names are configurable).
type Policy struct {
	// GovernanceNamespace is the governance loop's namespace (`triloop-governance` by default).
	GovernanceNamespace string `json:"governance_namespace"`
	// Loops maps a loop service's token subject to its own loop's namespace.
	Loops map[string]string `json:"loops"`
	// Web is the web service's token subject.
	Web string `json:"web"`
}

// LoadPolicy reads and checks the policy file.
func LoadPolicy(path string) (*Policy, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the authorization policy: %w", err)
	}
	var p Policy
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("parsing the authorization policy %s: %w", path, err)
	}
	if p.GovernanceNamespace == "" || p.Web == "" || len(p.Loops) == 0 {
		return nil, fmt.Errorf("authorization policy %s must name governance_namespace, web and loops", path)
	}
	return &p, nil
}

// call is what one rule looks at: who calls, which API, in which namespace.
type call struct {
	policy    *Policy
	subject   string
	own       string // the caller's own loop's namespace; "" for the web service
	web       bool
	method    string // the API's method name, e.g. "ResetWorkflowExecution"
	apiName   string // the full API name the server passes
	namespace string
}

// rule refuses a call when refuses says so; reason tells the caller why and what to do.
type rule struct {
	name    string
	refuses func(c call) bool
	reason  func(c call) string
}

// rewritesHistory: APIs that end, rewind, hide or reroute a workflow from outside it. In
// governance's namespace they would re-run or cut short a gate, so no service holds them.
var rewritesHistory = set(
	"ResetWorkflowExecution", "TerminateWorkflowExecution", "DeleteWorkflowExecution",
	"RequestCancelWorkflowExecution", "StartBatchOperation", "StopBatchOperation",
	"UpdateWorkflowExecutionOptions", "PauseWorkflowExecution", "UnpauseWorkflowExecution",
	"UpdateActivityOptions", "PauseActivity", "UnpauseActivity", "ResetActivity",
)

// endsWorkflows: APIs a loop may use, if ever, only on its own loop's workflows.
var endsWorkflows = set("ResetWorkflowExecution", "TerminateWorkflowExecution",
	"DeleteWorkflowExecution")

// webWrites: every write the web service makes (web/orchestration.py): start a run, a
// rollback or a governance write, send a run control signal, carry a person's decision as
// a named update. Signal-with-start is the start form of a signal. Reads stay allowed
// (results, counts, update results by PollWorkflowExecutionUpdate).
var webWrites = set("StartWorkflowExecution", "SignalWorkflowExecution",
	"SignalWithStartWorkflowExecution", "UpdateWorkflowExecution")

// rules, checked in order; the first that refuses answers. A call none refuses goes to
// the default authorizer (the token's namespace roles).
var rules = []rule{
	{
		name:    "nexus-http-api",
		refuses: func(c call) bool { return strings.HasPrefix(c.apiName, api.NexusServicePrefix) },
		reason: func(c call) string {
			return fmt.Sprintf("%s may not call %s: the Nexus HTTP API carries requests "+
				"between the server's own components only; call another loop through a "+
				"Nexus operation from a workflow", c.subject, c.method)
		},
	},
	{
		name: "governance-history",
		refuses: func(c call) bool {
			return c.namespace == c.policy.GovernanceNamespace && rewritesHistory[c.method]
		},
		reason: func(c call) string {
			return fmt.Sprintf("%s may not %s in %s: a governance workflow is ended or rewound "+
				"only by an operator with the admin token", c.subject, c.method, c.namespace)
		},
	},
	{
		name: "web-writes",
		refuses: func(c call) bool {
			return c.web && api.GetMethodMetadata(c.apiName).Access != api.AccessReadOnly &&
				!webWrites[c.method]
		},
		reason: func(c call) string {
			return fmt.Sprintf("%s may not call %s: the web service only starts workflows, "+
				"signals them and sends named updates", c.subject, c.method)
		},
	},
	{
		name:    "own-loop-only",
		refuses: func(c call) bool { return c.namespace != c.own && endsWorkflows[c.method] },
		reason: func(c call) string {
			return fmt.Sprintf("%s may not %s in %s: a service resets, terminates or deletes "+
				"only its own loop's workflows", c.subject, c.method, c.namespace)
		},
	},
}

// Authorizer applies the rules to triloop's service tokens, then the default authorizer.
// Any other caller (the operator's admin token, the server's own internal principal) goes
// to the default authorizer unchanged.
type Authorizer struct {
	policy *Policy
	next   authorization.Authorizer
}

// NewAuthorizer wraps next (the default authorizer) with the policy's rules.
func NewAuthorizer(policy *Policy, next authorization.Authorizer) *Authorizer {
	return &Authorizer{policy: policy, next: next}
}

// Authorize refuses with a PermissionDenied error that names the rule and why. The server
// hands it to the caller as it is (frontend.exposeAuthorizerErrors, which dev up turns on);
// a plain deny result would reach the caller as "Request unauthorized." with the reason
// only in the error's details.
func (a *Authorizer) Authorize(
	ctx context.Context, claims *authorization.Claims, target *authorization.CallTarget,
) (authorization.Result, error) {
	if c, ok := a.serviceCall(claims, target); ok {
		for _, r := range rules {
			if r.refuses(c) {
				reason := fmt.Sprintf("triloop rule %s: %s", r.name, r.reason(c))
				return authorization.Result{Decision: authorization.DecisionDeny, Reason: reason},
					serviceerror.NewPermissionDenied(reason, "")
			}
		}
	}
	return a.next.Authorize(ctx, claims, target)
}

// serviceCall describes the call if a service token makes it.
func (a *Authorizer) serviceCall(
	claims *authorization.Claims, target *authorization.CallTarget,
) (call, bool) {
	if claims == nil {
		return call{}, false
	}
	own, isLoop := a.policy.Loops[claims.Subject]
	isWeb := claims.Subject == a.policy.Web
	if !isLoop && !isWeb {
		return call{}, false
	}
	return call{policy: a.policy, subject: claims.Subject, own: own, web: isWeb,
		method: api.MethodName(target.APIName), apiName: target.APIName,
		namespace: target.Namespace}, true
}

func set(names ...string) map[string]bool {
	out := make(map[string]bool, len(names))
	for _, n := range names {
		out[n] = true
	}
	return out
}
