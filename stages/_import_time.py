"""When this package's import began and ended (wall clock).

``initpipe startup run`` names that time in each process (``"import initpipe"``): vLLM's
plugin loading imports the package in every process it starts. Imported first by the
package's ``__init__``, which sets :data:`ENDED_S` on its last line.
"""

import time

STARTED_S = time.time()
ENDED_S: float | None = None
