"""Pure domain logic: values, tool declarations, admission gates, states, intent.

Nothing in this package touches a database, a broker or the network; the
store, the worker and the providers build on it.
"""
