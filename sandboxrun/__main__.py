from sandboxrun.cli import app

app(prog_name="sandboxrun")
