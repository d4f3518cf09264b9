"""The replay console: pages, JSON API and CLI over PostgreSQL and the retry topics."""
