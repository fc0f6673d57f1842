"""initpipe inside other frameworks' loops: adapters that make their weight syncs initpipe's
checked refit.

What belongs here: one module per framework (:mod:`.trl`), each importing that framework
only when called, never at import time, and only initpipe's public live API.
"""
