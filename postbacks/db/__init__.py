"""The PostgreSQL adapter: the only package that imports ``psycopg``."""
