"""Graph passes run before tracing, one per file; `oxla.plan.prepare` runs them in order."""
