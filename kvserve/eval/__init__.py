"""`kvserve eval`: capability regression suites as data, answer extraction, sandboxed code grading,
a parallel runner over the OpenAI Chat API, a trace, a report and a TUI."""
