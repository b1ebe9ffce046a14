"""Developer tools: the local Kafka broker, fixture generator and benchmarks (not shipped)."""
