package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.temporal.io/api/serviceerror"
	"go.temporal.io/server/common/api"
	"go.temporal.io/server/common/authorization"
)

const (
	governanceNS = "triloop-governance"
	learningNS   = "triloop-learning"
	executionNS  = "triloop-execution"
)

var testPolicy = &Policy{
	GovernanceNamespace: governanceNS,
	Loops: map[string]string{"triloop-execution": executionNS,
		"triloop-learning": learningNS, "triloop-governance": governanceNS},
	Web: "triloop-web",
}

// claims as the default JWT claim mapper makes them from triloop's tokens.
func serviceClaims(subject string) *authorization.Claims {
	roles := map[string]authorization.Role{}
	if ns, ok := testPolicy.Loops[subject]; ok {
		roles[ns] = authorization.RoleWriter
	} else {
		for _, ns := range testPolicy.Loops {
			roles[ns] = authorization.RoleWriter
		}
	}
	return &authorization.Claims{Subject: subject, Namespaces: roles}
}

var admin = &authorization.Claims{Subject: "triloop-admin", System: authorization.RoleAdmin}

func TestRules(t *testing.T) {
	authz := NewAuthorizer(testPolicy, authorization.NewDefaultAuthorizer())
	cases := []struct {
		who       string
		claims    *authorization.Claims
		api       string
		namespace string
		rule      string // "" when allowed
	}{
		// (a) nobody but the operator rewrites a governance workflow
		{"web", serviceClaims("triloop-web"), "ResetWorkflowExecution", governanceNS, "governance-history"},
		{"web", serviceClaims("triloop-web"), "TerminateWorkflowExecution", governanceNS, "governance-history"},
		{"web", serviceClaims("triloop-web"), "DeleteWorkflowExecution", governanceNS, "governance-history"},
		{"web", serviceClaims("triloop-web"), "RequestCancelWorkflowExecution", governanceNS, "governance-history"},
		{"web", serviceClaims("triloop-web"), "StartBatchOperation", governanceNS, "governance-history"},
		{"web", serviceClaims("triloop-web"), "UpdateWorkflowExecutionOptions", governanceNS, "governance-history"},
		{"governance", serviceClaims("triloop-governance"), "ResetWorkflowExecution", governanceNS, "governance-history"},
		{"governance", serviceClaims("triloop-governance"), "TerminateWorkflowExecution", governanceNS, "governance-history"},
		{"learning", serviceClaims("triloop-learning"), "ResetWorkflowExecution", governanceNS, "governance-history"},
		{"execution", serviceClaims("triloop-execution"), "TerminateWorkflowExecution", governanceNS, "governance-history"},
		// (a) ... nor ends another loop's workflows
		{"execution", serviceClaims("triloop-execution"), "TerminateWorkflowExecution", learningNS, "own-loop-only"},
		{"learning", serviceClaims("triloop-learning"), "ResetWorkflowExecution", executionNS, "own-loop-only"},
		{"learning", serviceClaims("triloop-learning"), "TerminateWorkflowExecution", learningNS, ""},
		// (b) the web service writes only what it must
		{"web", serviceClaims("triloop-web"), "StartWorkflowExecution", governanceNS, ""},
		{"web", serviceClaims("triloop-web"), "SignalWorkflowExecution", learningNS, ""},
		{"web", serviceClaims("triloop-web"), "SignalWithStartWorkflowExecution", learningNS, ""},
		{"web", serviceClaims("triloop-web"), "UpdateWorkflowExecution", governanceNS, ""},
		{"web", serviceClaims("triloop-web"), "PollWorkflowExecutionUpdate", governanceNS, ""},
		{"web", serviceClaims("triloop-web"), "GetWorkflowExecutionHistory", governanceNS, ""},
		{"web", serviceClaims("triloop-web"), "CountWorkflowExecutions", executionNS, ""},
		{"web", serviceClaims("triloop-web"), "TerminateWorkflowExecution", learningNS, "web-writes"},
		{"web", serviceClaims("triloop-web"), "ResetWorkflowExecution", executionNS, "web-writes"},
		{"web", serviceClaims("triloop-web"), "RespondWorkflowTaskCompleted", governanceNS, "web-writes"},
		{"web", serviceClaims("triloop-web"), "PollWorkflowTaskQueue", governanceNS, "web-writes"},
		{"web", serviceClaims("triloop-web"), "ExecuteMultiOperation", governanceNS, "web-writes"},
		// the workers' own calls still pass
		{"governance", serviceClaims("triloop-governance"), "PollWorkflowTaskQueue", governanceNS, ""},
		{"governance", serviceClaims("triloop-governance"), "RespondWorkflowTaskCompleted", governanceNS, ""},
		{"governance", serviceClaims("triloop-governance"), "SignalWithStartWorkflowExecution", governanceNS, ""},
		{"execution", serviceClaims("triloop-execution"), "PollNexusTaskQueue", executionNS, ""},
		{"execution", serviceClaims("triloop-execution"), "RespondNexusTaskCompleted", executionNS, ""},
		// the operator's admin token is not narrowed
		{"admin", admin, "ResetWorkflowExecution", governanceNS, ""},
		{"admin", admin, "TerminateWorkflowExecution", governanceNS, ""},
	}
	for _, tc := range cases {
		checkWorkflowService(t, authz, tc.who, tc.claims, tc.api, tc.namespace, tc.rule)
	}
}

func checkWorkflowService(t *testing.T, authz authorization.Authorizer, who string,
	claims *authorization.Claims, method, namespace, rule string) {
	t.Helper()
	target := &authorization.CallTarget{APIName: api.WorkflowServicePrefix + method,
		Namespace: namespace}
	check(t, authz, who, claims, target, rule)
}

// (c) no service token reaches the Nexus HTTP API; only the server's components do.
func TestNexusHTTPAPI(t *testing.T) {
	authz := NewAuthorizer(testPolicy, authorization.NewDefaultAuthorizer())
	for _, method := range []string{"DispatchByEndpoint", "DispatchByNamespaceAndTaskQueue",
		"CompleteNexusOperation"} {
		target := &authorization.CallTarget{APIName: api.NexusServicePrefix + method,
			Namespace: executionNS, NexusEndpointName: "triloop-execution"}
		for _, subject := range []string{"triloop-web", "triloop-execution", "triloop-learning",
			"triloop-governance"} {
			check(t, authz, subject, serviceClaims(subject), target, "nexus-http-api")
		}
		internal := &authorization.Claims{System: authorization.RoleAdmin,
			AuthType: authorization.InternalPrincipalType, Subject: authorization.InternalPrincipalName}
		check(t, authz, "the server itself", internal, target, "")
	}
}

// A call the rules let through still needs the token's role: the default authorizer decides.
func TestDefaultAuthorizerStillDecides(t *testing.T) {
	authz := NewAuthorizer(testPolicy, authorization.NewDefaultAuthorizer())
	target := &authorization.CallTarget{
		APIName: api.WorkflowServicePrefix + "StartWorkflowExecution", Namespace: governanceNS}
	result, err := authz.Authorize(context.Background(), serviceClaims("triloop-learning"), target)
	if err != nil || result.Decision != authorization.DecisionDeny {
		t.Fatalf("learning starting a governance workflow: got %+v, %v; want the default deny",
			result, err)
	}
	result, _ = authz.Authorize(context.Background(), nil, target)
	if result.Decision != authorization.DecisionDeny {
		t.Fatalf("no token: got %+v, want deny", result)
	}
}

func check(t *testing.T, authz authorization.Authorizer, who string,
	claims *authorization.Claims, target *authorization.CallTarget, rule string) {
	t.Helper()
	result, err := authz.Authorize(context.Background(), claims, target)
	var denied *serviceerror.PermissionDenied
	switch {
	case rule == "" && (err != nil || result.Decision != authorization.DecisionAllow):
		t.Errorf("%s %s in %s: refused (%v), want allowed", who, target.APIName,
			target.Namespace, err)
	case rule != "" && (err == nil || result.Decision != authorization.DecisionDeny):
		t.Errorf("%s %s in %s: allowed, want refused by %s", who, target.APIName,
			target.Namespace, rule)
	case rule != "" && !errors.As(err, &denied):
		t.Errorf("%s %s in %s: %v is not PermissionDenied", who, target.APIName,
			target.Namespace, err)
	case rule != "" && !strings.Contains(err.Error(), "triloop rule "+rule+":"):
		t.Errorf("%s %s in %s: %q, want rule %s", who, target.APIName, target.Namespace,
			err.Error(), rule)
	}
}
