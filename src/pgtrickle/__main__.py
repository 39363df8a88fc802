"""``python -m pgtrickle`` runs the command line."""

from pgtrickle.cli.main import app

app(prog_name="pgtrickle")
