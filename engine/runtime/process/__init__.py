"""The engine as an operating-system process: supervisor, watchdog, metrics and health, memory
and the cycle collector, the latency trace, and the guards that wrap a protocol step."""
