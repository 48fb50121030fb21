package outbox

// PurgeSQL is the purge's statement, for tests of its plan.
var PurgeSQL = purgeSQL
