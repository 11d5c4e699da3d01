// Command rulecheck checks Prometheus rule files as `promtool check rules` does,
// with Prometheus's own code (model/rulefmt): unknown fields refused, every expr
// through the real PromQL parser (types included: rate() of an instant vector is
// an error), every label and annotation template parsed, names and durations
// validated. promtool itself links every service-discovery SDK; this links the
// rule parser alone. Headroom's tests run it on the PrometheusRule's groups
// (tests/headroom/test_monitoring.py).
//
//	rulecheck FILE...    exit 0 and "FILE: N rules in M groups" per file; else 1, the errors on stderr
package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rulecheck FILE...")
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	failed := false
	for _, file := range os.Args[1:] {
		// Legacy names: valid under Prometheus 2 and 3 alike.
		groups, errs := rulefmt.ParseFile(file, false, model.LegacyValidation, p, logger)
		for _, err := range errs {
			fmt.Fprintln(os.Stderr, err)
			failed = true
		}
		if len(errs) > 0 || groups == nil {
			continue
		}
		rules := 0
		for _, group := range groups.Groups {
			rules += len(group.Rules)
		}
		fmt.Printf("%s: %d rules in %d groups\n", file, rules, len(groups.Groups))
	}
	if failed {
		os.Exit(1)
	}
}
