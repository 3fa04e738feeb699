from hpctrain._cli import console_entry
from hpctrain.launch.runner import main

console_entry(main, "launch")
