"""Destructive fault tests, run against a private RabbitMQ node (``make test-faults``)."""
