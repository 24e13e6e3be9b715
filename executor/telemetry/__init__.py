"""Metrics the fleet writes, and the exporter that serves them with database gauges."""
