# vramlab report: gnuplot mem_per_card.gp in this folder re-renders mem_per_card.png
if (!exists("vl_png")) vl_png = 'mem_per_card.png'
set terminal png size 1400,600 noenhanced
set output vl_png
set multiplot layout 1,2 title 'Memory per card vs cards (planned, 512x512, batch 8 per card): DDP keeps a full copy, ZeRO-1 shards the optimizer'
set xlabel 'cards'
set grid
set logscale x 2
set xrange [0.9:9]
set xtics (1, 2, 4, 8)
set title 'peak per card (axis from 7.8 GB, not 0)'
set ylabel 'GB per card'
set yrange [7.8:8.7]
set key left bottom
plot 'mem_per_card.dat' index 0 using 1:2 with linespoints lw 6.0 pt 5 title 'dp (dp)', 'mem_per_card.dat' index 1 using 1:2 with linespoints lw 4.5 pt 7 title 'ddp (ddp)', 'mem_per_card.dat' index 2 using 1:2 with linespoints lw 3.0 pt 9 title 'ddp-tuned (ddp)', 'mem_per_card.dat' index 3 using 1:2 with linespoints lw 2.0 pt 11 title 'zero1 (zero1)'
set title 'weights + gradients + optimizer state per card (axis from 0)'
set yrange [0:*]
set key left bottom
plot 'mem_per_card.dat' index 0 using 1:3 with linespoints lw 6.0 pt 5 title 'dp (dp)', 'mem_per_card.dat' index 1 using 1:3 with linespoints lw 4.5 pt 7 title 'ddp (ddp)', 'mem_per_card.dat' index 2 using 1:3 with linespoints lw 3.0 pt 9 title 'ddp-tuned (ddp)', 'mem_per_card.dat' index 3 using 1:3 with linespoints lw 2.0 pt 11 title 'zero1 (zero1)'
unset multiplot
