"""Make the toy stage modules importable as ``coretoys.<name>``."""
import sys
from pathlib import Path

HERE = Path(__file__).parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
