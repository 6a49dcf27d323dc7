// Command temporal-server is the Temporal server (v1.32.2) as triloop runs it: the stock
// server's start command, with triloop's narrower authorizer in front of the default one
// (authorizer.go) and mutual TLS on the HTTP API ports (tls.go). The default JWT claim
// mapper still reads each caller's token.
//
//	temporal-server --config-file config.yaml --policy-file authorization.json \
//	    --service frontend --service internal-frontend ...
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	_ "time/tzdata" // embed tzdata as a fallback, as the stock server does

	"go.temporal.io/server/common/authorization"
	"go.temporal.io/server/common/config"
	"go.temporal.io/server/common/log"
	"go.temporal.io/server/common/metrics"
	_ "go.temporal.io/server/common/persistence/sql/sqlplugin/sqlite" // triloop's store
	"go.temporal.io/server/common/rpc/encryption"
	"go.temporal.io/server/temporal"
)

type services []string

func (s *services) String() string     { return strings.Join(*s, ",") }
func (s *services) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "temporal-server:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	flags := flag.NewFlagSet("temporal-server", flag.ContinueOnError)
	configFile := flags.String("config-file", "", "the server's YAML config")
	policyFile := flags.String("policy-file", "", "who holds which service token (JSON)")
	var names services
	flags.Var(&names, "service", "a service to start (repeat for each)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *configFile == "" || *policyFile == "" || len(names) == 0 {
		return fmt.Errorf("--config-file, --policy-file and at least one --service are required")
	}
	cfg, err := config.Load(config.WithConfigFile(*configFile))
	if err != nil {
		return fmt.Errorf("loading %s: %w", *configFile, err)
	}
	policy, err := LoadPolicy(*policyFile)
	if err != nil {
		return err
	}
	logger := log.NewZapLogger(log.BuildZapLogger(cfg.Log))
	options, err := serverOptions(cfg, policy, logger)
	if err != nil {
		return err
	}
	server, err := temporal.NewServer(append(options, temporal.ForServices(names))...)
	if err != nil {
		return fmt.Errorf("creating the server: %w", err)
	}
	return server.Start()
}

func serverOptions(cfg *config.Config, policy *Policy, logger log.Logger) (
	[]temporal.ServerOption, error,
) {
	claimMapper, err := authorization.GetClaimMapperFromConfig(&cfg.Global.Authorization, logger)
	if err != nil {
		return nil, fmt.Errorf("the claim mapper: %w", err)
	}
	audienceMapper, err := authorization.GetAudienceMapperFromConfig(&cfg.Global.Authorization)
	if err != nil {
		return nil, fmt.Errorf("the audience mapper: %w", err)
	}
	tlsProvider, err := encryption.NewTLSConfigProviderFromConfig(
		cfg.Global.TLS, metrics.NoopMetricsHandler, logger, nil)
	if err != nil {
		return nil, fmt.Errorf("the TLS config: %w", err)
	}
	return []temporal.ServerOption{
		temporal.WithConfig(cfg),
		temporal.WithLogger(logger),
		temporal.InterruptOn(temporal.InterruptCh()),
		temporal.WithAuthorizer(NewAuthorizer(policy, authorization.NewDefaultAuthorizer())),
		temporal.WithClaimMapper(func(*config.Config) authorization.ClaimMapper {
			return claimMapper
		}),
		temporal.WithAudienceGetter(func(*config.Config) authorization.JWTAudienceMapper {
			return audienceMapper
		}),
		temporal.WithTLSConfigFactory(httpOverInternode{tlsProvider}),
	}, nil
}
