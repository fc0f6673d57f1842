"""The contract with vLLM: what initpipe mirrors of vLLM's code, fingerprinted, and checked.

What belongs here: reading a vLLM's source without importing it (:mod:`.source`: an
installed vLLM, a folder holding ``vllm/``, a wheel), canonical digests of the functions
and signatures initpipe declares (:mod:`.fingerprint`), the declarations, scoped by vLLM
release (:mod:`.declare`), the lock files recorded per vLLM distribution and version, each
from its release's declarations (``locks/``), and the verdict per capability that the
worker gates and ``initpipe doctor`` read, naming the release matched (:mod:`.report`).
Nothing here imports vLLM or torch.
"""

from __future__ import annotations
