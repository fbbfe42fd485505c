"""Actions: one module per command (validate, inspect, identity, diff, stage, slice,
verify_swap, decode, rules, check, plan). Each takes a frozen `Options` and returns one Report
or a typed result its renderer takes; `errors` maps exceptions to exit codes for the CLI and
the gate; `inputs` turns a path or `org/name[@revision]` into a local path."""
