"""DVC stage `check_params`: params.yaml validated as a whole before any other stage runs.

DVC deletes a stage's outputs before running it, so a typo found by the stage itself (e.g. `mtl.alpha: -1`) used to
cost that stage's previous outputs. Every stage is downstream of this one (acquire depends on its output), so `dvc repro`
stops here, with one error line, before anything is deleted. The output is the schema the file was checked against:
it changes only when medrank/params.py's schema does, so a valid edit re-runs nothing else by itself.
"""

import json

from medrank.core import layout
from medrank.core.io import write_text
from medrank.params import Params, load_params
from medrank.stage.runner import run


def main(params_path: str = str(layout.PARAMS_FILE)) -> None:
    load_params(params_path)
    write_text(layout.PARAMS_SCHEMA, json.dumps(Params.model_json_schema(), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    run(main)
