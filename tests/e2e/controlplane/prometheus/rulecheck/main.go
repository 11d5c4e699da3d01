// Command rulecheck checks Prometheus rule files as `promtool check rules` does,
// and evaluates their alerts over given series as `promtool test rules` does, with
// Prometheus's own code: model/rulefmt (unknown fields refused, every expr through
// the real PromQL parser, types included, every template parsed), and the PromQL
// engine and rules.AlertingRule over an in-memory TSDB (`for:` held, labels and
// annotations expanded). promtool itself links every service-discovery SDK; this
// links the rule parser, the engine and the TSDB. Headroom's tests run it on the
// PrometheusRule's groups (tests/headroom/test_monitoring.py).
//
//	rulecheck FILE...
//	    exit 0 and "FILE: N rules in M groups" per file; else 1, the errors on stderr
//	rulecheck -eval SCENARIO RULES
//	    SCENARIO (JSON): {"interval": "1m", "series": [{"series": "m{l=\"v\"}",
//	    "values": "1x10 0x20"}], "at": ["15m", "2h"]}, values in promtool's notation,
//	    one per interval from time 0; every alert is evaluated each interval from 0 to
//	    the last "at". Prints one JSON object per "at": {"at": "15m", "firing":
//	    [{"alert": ..., "labels": {...}, "annotations": {...}}]}, pending ones left out.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/rules"
	"github.com/prometheus/prometheus/tsdb"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func main() {
	p := parser.NewParser(parser.Options{})
	if len(os.Args) == 4 && os.Args[1] == "-eval" {
		if err := evaluate(p, os.Args[2], os.Args[3]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) < 2 || os.Args[1] == "-eval" {
		fmt.Fprintln(os.Stderr, "usage: rulecheck FILE... | rulecheck -eval SCENARIO RULES")
		os.Exit(2)
	}
	failed := false
	for _, file := range os.Args[1:] {
		groups, errs := parse(p, file)
		for _, err := range errs {
			fmt.Fprintln(os.Stderr, err)
			failed = true
		}
		if len(errs) > 0 {
			continue
		}
		count := 0
		for _, group := range groups.Groups {
			count += len(group.Rules)
		}
		fmt.Printf("%s: %d rules in %d groups\n", file, count, len(groups.Groups))
	}
	if failed {
		os.Exit(1)
	}
}

func parse(p parser.Parser, file string) (*rulefmt.RuleGroups, []error) {
	// Legacy names: valid under Prometheus 2 and 3 alike.
	groups, errs := rulefmt.ParseFile(file, false, model.LegacyValidation, p, quiet)
	if len(errs) == 0 && groups == nil {
		errs = []error{fmt.Errorf("%s: no rule groups", file)}
	}
	return groups, errs
}

type scenario struct {
	Interval string `json:"interval"`
	Series   []struct {
		Series string `json:"series"`
		Values string `json:"values"`
	} `json:"series"`
	At []string `json:"at"`
}

type firing struct {
	Alert       string            `json:"alert"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

func evaluate(p parser.Parser, scenarioFile, rulesFile string) error {
	raw, err := os.ReadFile(scenarioFile)
	if err != nil {
		return err
	}
	var sc scenario
	if err := json.Unmarshal(raw, &sc); err != nil {
		return fmt.Errorf("%s: %w", scenarioFile, err)
	}
	interval, err := model.ParseDuration(sc.Interval)
	if err != nil || interval <= 0 {
		return fmt.Errorf("%s: interval %q: want a duration such as 1m", scenarioFile, sc.Interval)
	}
	step := time.Duration(interval)
	ats := map[time.Duration]string{}
	var last time.Duration
	for _, text := range sc.At {
		at, err := model.ParseDuration(text)
		if err != nil {
			return fmt.Errorf("%s: at %q: %w", scenarioFile, text, err)
		}
		if time.Duration(at)%step != 0 {
			return fmt.Errorf("%s: at %q is not a multiple of the interval", scenarioFile, text)
		}
		ats[time.Duration(at)] = text
		last = max(last, time.Duration(at))
	}

	groups, errs := parse(p, rulesFile)
	if len(errs) > 0 {
		return errs[0]
	}
	var alerting []*rules.AlertingRule
	for _, group := range groups.Groups {
		for _, rule := range group.Rules {
			if rule.Alert == "" {
				continue
			}
			expr, err := p.ParseExpr(rule.Expr)
			if err != nil {
				return fmt.Errorf("%s: %w", rule.Alert, err)
			}
			alerting = append(alerting, rules.NewAlertingRule(
				rule.Alert, expr, time.Duration(rule.For), time.Duration(rule.KeepFiringFor),
				labels.FromMap(rule.Labels), labels.FromMap(rule.Annotations), labels.EmptyLabels(),
				"", true, quiet,
			))
		}
	}

	dir, err := os.MkdirTemp("", "rulecheck-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := tsdb.Open(dir, quiet, nil, tsdb.DefaultOptions(), nil)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx := context.Background()
	app := db.Appender(ctx)
	for _, s := range sc.Series {
		series, values, err := p.ParseSeriesDesc(s.Series + " " + s.Values)
		if err != nil {
			return fmt.Errorf("series %s %q: %w", s.Series, s.Values, err)
		}
		for i, value := range values {
			if value.Omitted {
				continue
			}
			at := time.Duration(i) * step
			if _, err := app.Append(0, series, at.Milliseconds(), value.Value); err != nil {
				return fmt.Errorf("series %s: %w", s.Series, err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		return err
	}

	engine := promql.NewEngine(promql.EngineOpts{
		Logger: quiet, MaxSamples: 50_000_000, Timeout: time.Minute,
		LookbackDelta: 5 * time.Minute, Parser: p,
	})
	query := rules.EngineQueryFunc(engine, db)
	out := json.NewEncoder(os.Stdout)
	for at := time.Duration(0); at <= last; at += step {
		when := time.Unix(0, 0).UTC().Add(at)
		for _, rule := range alerting {
			if _, err := rule.Eval(ctx, 0, when, query, nil, 0); err != nil {
				return fmt.Errorf("%s at %s: %w", rule.Name(), model.Duration(at), err)
			}
		}
		text, asked := ats[at]
		if !asked {
			continue
		}
		result := struct {
			At     string   `json:"at"`
			Firing []firing `json:"firing"`
		}{At: text, Firing: []firing{}}
		for _, rule := range alerting {
			for _, alert := range rule.ActiveAlerts() {
				if alert.State != rules.StateFiring {
					continue
				}
				result.Firing = append(result.Firing, firing{
					Alert: rule.Name(), Labels: alert.Labels.Map(),
					Annotations: alert.Annotations.Map(),
				})
			}
		}
		sort.Slice(result.Firing, func(i, j int) bool {
			a, b := result.Firing[i], result.Firing[j]
			if a.Alert != b.Alert {
				return a.Alert < b.Alert
			}
			return labels.FromMap(a.Labels).String() < labels.FromMap(b.Labels).String()
		})
		if err := out.Encode(result); err != nil {
			return err
		}
	}
	return nil
}
