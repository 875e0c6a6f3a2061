"""What users call: ``Sandbox``, jobs, the files API and the login snapshot."""
