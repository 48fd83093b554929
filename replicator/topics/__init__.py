"""Topics: which are selected, their destination names, cycles, and provenance headers. Imports no other room."""
