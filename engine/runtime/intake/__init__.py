"""The input side of step 2: consume, decode and order the records of each task."""
