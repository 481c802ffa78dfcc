// Package datadriven runs scenario scripts: readable text files of test
// cases, each a directive line, optional input lines, a "----" separator and
// the expected output, ended by a blank line. Lines starting with # between
// cases are comments. Run the tests with -rewrite to regenerate the expected
// outputs from what the code does now (then read the diff before you commit
// it: the scripts are the contract written down).
//
//	submit step=1
//	c1 echo {"text":"hi"}
//	----
//	BatchSubmitted r1/1 ...
//
// It follows the idea of cockroachdb's datadriven package, written small for
// this project.
//
// Imports: nothing but the standard library.
package datadriven
