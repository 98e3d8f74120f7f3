// Package metrics is agenthost's Prometheus instrumentation: a registry,
// a runtime.Observer that counts what the runtime does, collectors that
// read the runtime's own counters at scrape time, and Executor/Builder
// decorators that time and count plugin calls.
//
// Wiring (serve):
//
//	m := metrics.New()
//	ledger := httpapi.NewUsageLedger()
//	rt, _ := runtime.New(runtime.Options{…, Observer: metrics.Tee{m, ledger}})
//	m.RegisterRuntime(rt)
//	m.RegisterActiveRuns(store, tenantsInForce, 10000, log)
//	tool := m.Executor("slow-job", hostExecutor) // and m.Builder(name, hostBuilder)
//	… httpapi.Config{Metrics: m.Handler()}
//	… after each retention pass: m.Pruned(stats)
//
// # Metrics
//
// Every name starts with agenthost_. The Go runtime (go_*) and process
// (process_*) collectors are registered too.
//
//	name                                          type       labels                          meaning
//	agenthost_run_transitions_total               counter    tenant, status                  Runs that entered status (pending = submitted; running, waiting, completed, failed, cancelled)
//	agenthost_run_duration_seconds                histogram  tenant, agent, status           Runs that ended, creation to end, by the agent they ran as (pinned name) and status completed|failed|cancelled
//	agenthost_runs_active                         gauge      tenant, status                  Runs pending, running or waiting, read from the store's status index at scrape (RegisterActiveRuns; capped at its limit)
//	agenthost_effects_settled_total               counter    tenant, kind, state, class      effect attempts settled: kind model|tool, state done|failed|cancelled, class the error class ("" when done)
//	agenthost_plugin_call_duration_seconds        histogram  plugin, export                  plugin call latency (build, start, poll, attach, cancel), through Executor/Builder
//	agenthost_plugin_call_errors_total            counter    plugin, export, class           plugin calls that returned an error: the abi error class, executor_unavailable, plugin_timeout, cancelled or other
//	agenthost_store_commit_duration_seconds       histogram  -                               store commit latency, as the runtime's clock measured it
//	agenthost_store_commit_errors_total           counter    reason                          failed commits: version_conflict, fenced, unavailable, closed, other
//	agenthost_store_commits_total                 counter    -                               commits that wrote
//	agenthost_store_duplicate_commits_total       counter    -                               commits answered from an applied command ID
//	agenthost_store_conflicts_total               counter    -                               version conflicts retried
//	agenthost_store_commit_groups_total           counter    -                               transactions, one sync each, that wrote a group of Run creations and commits (RegisterCommitGroups)
//	agenthost_store_grouped_commits_total         counter    -                               the Run creations and commits those transactions wrote
//	agenthost_runtime_dropped_outcomes_total      counter    -                               stale or repeated outcomes dropped
//	agenthost_runtime_ownership_boundaries_total  counter    -                               sessions given up on lost ownership
//	agenthost_executor_calls_total                counter    plugin, kind, export, state,    executor plugin calls by what they came back with, through Executor: state pending|done|failed|cancelled|unknown, or error
//	                                                         class                           when no reply; class that of the failed reply or of the error ("" otherwise)
//	agenthost_model_call_seconds                  histogram  plugin, state, class            model calls, from the attempt's dispatch to the call that settled it (done, failed or a plugin error), through Executor
//	agenthost_model_time_to_first_token_seconds   histogram  plugin                          streamed model calls, from the start of the executor call to its first model_delta, through Executor and Events
//	agenthost_executor_unavailable_total          counter    -                               executor calls that found it unavailable
//	agenthost_recovery_actions_total              counter    decision                        recovery decisions: reattach, settle, retry, fail, fail_run, defer
//	agenthost_recovery_passes_total               counter    -                               recovery passes run
//	agenthost_recovery_sessions_taken_total       counter    -                               orphaned sessions taken over
//	agenthost_watchdog_reports_total              counter    tenant                          Runs the watchdog found stuck
//	agenthost_http_limited_total                  counter    limit, tenant                   connections and requests a limit of the API refused (Limited; tenant "" when none)
//	agenthost_plugin_http_refused_total           counter    plugin, reason                  agenthost_http requests refused: reason host (off the allow-list) or address (a name resolved to loopback, private, link-local, ...)
//	agenthost_watcher_queue_depth                 gauge      -                               polls and wake-ups waiting in the Watcher
//	agenthost_ready                               gauge      -                               1 once recovery's first pass is done; 0 if the node lease is lost
//	agenthost_model_tokens_total                  counter    tenant, type                    model tokens used, type input|output
//	agenthost_retention_pruned_total              counter    what                            pruned from terminal Runs: runs, events, commands
//	agenthost_retention_prunes_total              counter    -                               retention passes run
//
// Tenant, plugin and agent labels are bounded by the config (a Run keeps
// its agent's pinned name); no label holds a Run, session or effect ID.
package metrics
