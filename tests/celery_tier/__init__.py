"""The Celery tier: a real worker on RabbitMQ (named celery_tier, not celery: see tests/README.md)."""
