"""Tools around the runtime: the `svodrt` command line (run, info, verify, profile), bundle
descriptions and `verify`. They use svodrt's public modules and need only its dependencies; they are
kept out of svodrt/ so the code that maps and runs bundles stays small enough to audit (under 2,000
lines, docs/architecture.md "Runtime")."""
