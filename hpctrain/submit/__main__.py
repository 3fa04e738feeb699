from hpctrain.submit.cli import run

run()
