"""Monitoring integrations: the Grafana dashboard (generated) and the Prometheus alerting rules."""
