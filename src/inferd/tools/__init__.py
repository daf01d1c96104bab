"""The `inferd <verb>` tools: each in its own package (`perf/`, ...), reaching servers only through
`inferd.client`, so what they measure is what a user's client gets."""
