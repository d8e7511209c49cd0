from attnx.cli import main

main()
