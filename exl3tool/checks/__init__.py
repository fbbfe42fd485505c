"""Rule families and the checks that produce findings; nothing here prints."""
