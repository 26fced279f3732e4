"""CLI sub-commands, one module each (discovered by ``skill_server.cli``)."""
