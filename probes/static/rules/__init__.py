"""One module per static rule; each defines one :class:`probes.static.base.Rule` subclass.

The engine discovers them (``probes.static.engine.all_rules``); nothing lists them by hand.
"""
