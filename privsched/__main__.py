from privsched.cli import main

main()
