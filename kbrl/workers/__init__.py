"""Job queue (Celery on Redis, in-process default) — issue #4; nothing here yet."""
