;; spin: an export that never returns. Admission must refuse it: its test runs out of fuel
;; (or hits the time limit) in the zero-authority sandbox, and nothing is stored.
(module
  (func (export "spin") (result i32)
    (loop $forever (br $forever))
    (i32.const 0)))
