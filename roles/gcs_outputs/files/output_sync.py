# Copyright: hostnet.llamafactory contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The sync service of a job on a node: every complete checkpoint of this node to the bucket
while the rank trains (plugins/module_utils/_gcs_outputs.py run_service, which lies next to this
file with _job.py and _results.py).

    python3 output_sync.py CONFIG.json
"""

import importlib
import sys


def main(argv):
    outputs = importlib.import_module("_gcs_outputs")  # installed next to this file
    return outputs.run_service(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
