// Package sweep runs job arrays (sweeps): one submission of many batch
// sessions made from one template, at most a cap of them unfinished at
// once.
//
// The API writes an array's record (arrays/<id>) and nothing else; the
// Controller, which runs in every placer process and in voyager dev,
// creates the elements as ordinary sessions <id>-<index>, folds each
// finished element's result into the record, and stops the elements of a
// stopped array. The cap is enforced here, by the system, not by the
// client that submitted the array: an element is created only in a
// transaction that compares the record's revision and writes the new
// count of existing elements, and only while that count less the
// finished ones is below the cap. Any number of controllers may run: a
// stale decision fails its comparison and is made again from a fresh
// read.
package sweep
