"""The MCP server and the CLI: thin adapters over ``knowledge``, ``probes`` and ``templates``."""
