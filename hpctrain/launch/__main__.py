from hpctrain._errors import cli_entry
from hpctrain.launch.runner import main

cli_entry(main, "hpctrain.launch")
