"""Pool classes, one module each, named as Celery names its own (``celery.concurrency.<pool>``)."""
