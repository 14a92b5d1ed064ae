from rmqstore_cli.app import run

run()
