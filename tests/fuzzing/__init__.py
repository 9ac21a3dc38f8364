"""Bundle fuzzing: mutations of valid bundles, each loaded and run in an isolated worker process."""
