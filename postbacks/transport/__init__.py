"""The HTTP adapter: the only package that imports ``aiohttp`` on the delivery path."""
