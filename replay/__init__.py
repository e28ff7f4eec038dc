"""Policy semantics and the stateful replay: pure, typed functions over arrays, no Spark (SPEC §3, §9)."""
