"""``python -m capo_verl.launch``: the launcher's name before it moved into the CPU port, kept so that commands and
imports written for it still work. The launcher is :mod:`capo_verl.cpu.launch`; importing this module gives that
module itself (same functions, same state)."""

import sys

from capo_verl.cpu import launch as _launch

if __name__ == "__main__":
    sys.exit(_launch.main())
else:
    sys.modules[__name__] = _launch
