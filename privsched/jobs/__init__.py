"""Jobs: the context a granted job runs in, and the built-in job kinds."""
